"""Naming profiles served by the real otel-gpu process."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu import sim
from testkit.exposition import parse_samples, series
from testkit.kubelet import container, devices, pod
from testkit.process import run_cli, wait_until
from tests.support.nvml import first_sample_values, profile_uuids

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parents[1] / "export" / "naming" / "fixtures"
DEFAULT_CSV = FIXTURES / "dcgm-default-counters.csv"
COMPAT_CSV = DEFAULT_CSV.with_name("dcgm-1x-compatibility.csv")
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname",
               "DCGM_FI_DRIVER_VERSION"}
# What promtool's linter says about dcgm-exporter's own names, which the profile
# must keep: camelCase labels (UUID, modelName, Hostname, ...) and counters
# without a _total suffix, and a name with "COUNTER" in it.
INHERENT_LINT = re.compile(
    r"^DCGM_FI_\w+ (label names should be written in 'snake_case' not 'camelCase'"
    r"|counter metrics should have \"_total\" suffix"
    r"|metric name should not include type 'counter')$"
)


def _wait_for(proc, name: str) -> str:
    """The body once the first sample shows ``name`` (no self-metrics in dcgm-only mode)."""
    return wait_until(lambda: (lambda t: t if series(t, name) else None)(proc.metrics()),
                      what=name)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
def test_dcgm_profile_serves_dcgm_exporters_names_units_and_labels(collector):
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "--node-name", "gpu-node-1",
                     interval="1h")
    text = _wait_for(proc, "DCGM_FI_DEV_GPU_TEMP")
    assert "hw_power_watts" not in text and "DCGM_FI_DEV_GPU_TEMP" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    findings = [ln for ln in (lint.stdout + lint.stderr).splitlines() if ln.strip()]
    assert lint.returncode in (0, 3), lint.stderr  # 1 would be a parse error
    unexpected = [ln for ln in findings if not INHERENT_LINT.match(ln)]
    assert unexpected == [], unexpected
    expected = first_sample_values("h100x8")
    by_uuid = lambda name: {lab["UUID"]: (lab, v) for lab, v in series(text, name)}  # noqa: E731
    for uuid, want in expected.items():
        labels, temp = by_uuid("DCGM_FI_DEV_GPU_TEMP")[uuid]
        assert set(labels) == DCGM_LABELS
        assert labels["hostname"] == "gpu-node-1"
        assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert temp == want["temp"]
        assert by_uuid("DCGM_FI_DEV_POWER_USAGE")[uuid][1] == pytest.approx(want["power_w"])
        assert by_uuid("DCGM_FI_DEV_FB_USED")[uuid][1] == pytest.approx(
            want["used"] / 2**20)
    for name in ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
                 "DCGM_FI_DEV_GPU_UTIL"):
        assert len(series(text, name)) == 8, name
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text


def test_three_profiles_from_one_sample(collector, kubelet):
    uuids = profile_uuids("h100x8")
    kubelet.set_pods([pod("train", container("main", devices("nvidia.com/gpu", uuids[5])))])
    proc = collector("--simulate", "h100x8", "--naming", "otel,dcgm,kubelet",
                     "--kubelet-socket", kubelet.socket_path, "--kubelet-interval", "0.1",
                     interval="1h")
    text = _wait_for(proc, "container_accelerator_memory_used_bytes")
    assert series(text, "otel_gpu_samples_total")[0][1] == 1
    otel = {lab["hw_id"]: v for lab, v in series(text, "hw_gpu_memory_usage_bytes")}
    dcgm = {lab["UUID"]: v for lab, v in series(text, "DCGM_FI_DEV_FB_USED")}
    assert len(otel) == 8 and {k: v / 2**20 for k, v in otel.items()} == pytest.approx(dcgm)
    ((labels, used),) = series(text, "container_accelerator_memory_used_bytes")
    assert labels == {"container": "main", "namespace": "default", "pod": "train",
                      "make": "nvidia", "model": "NVIDIA H100 80GB HBM3", "acc_id": uuids[5]}
    # the kubelet's (v1) used counts the driver's reservation; its total is the physical one
    reserved = {lab["hw_id"]: v for lab, v in series(text, "nvidia_gpu_memory_reserved_bytes")}
    assert reserved[uuids[5]] > 0
    assert used == otel[uuids[5]] + reserved[uuids[5]]
    ((_, total),) = series(text, "container_accelerator_memory_total_bytes")
    limit = {lab["hw_id"]: v for lab, v in series(text, "hw_gpu_memory_limit_bytes")}
    free = {lab["hw_id"]: v for lab, v in series(text, "nvidia_gpu_memory_free_bytes")}
    assert total == limit[uuids[5]] == used + free[uuids[5]]
    ((_, duty),) = series(text, "container_accelerator_duty_cycle")
    util = series(text, "hw_gpu_utilization", hw_id=uuids[5], hw_gpu_task="general")[0][1]
    assert duty == pytest.approx(100 * util)


def test_default_counters_file_and_what_cannot_be_exported(collector):
    proc = collector("--simulate", "t4", "--naming", "dcgm", "-f", str(DEFAULT_CSV))
    text = _wait_for(proc, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert series(text, "DCGM_FI_DEV_FB_RESERVED")  # in the current file
    assert series(text, "DCGM_FI_DEV_FB_TOTAL") == []  # not in that file
    lines = [ln for ln in proc.lines if "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in ln]
    assert len(lines) == 1 and "vGPU guest" in lines[0]


def test_dcgm_names_current_serves_4_9_names_in_base_units(collector):
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "--dcgm-names", "current",
                     interval="1h")
    text = _wait_for(proc, "DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    expected = first_sample_values("h100x8")
    hertz = {lab["UUID"]: v for lab, v in series(text, "DCGM_FI_DEV_SM_CLOCK_HERTZ")}
    used = {lab["UUID"]: v for lab, v in series(text, "DCGM_FI_DEV_FB_USED_BYTES")}
    ratio = {lab["UUID"]: v for lab, v in series(text, "DCGM_FI_DEV_GPU_UTIL_RATIO")}
    for uuid, want in expected.items():
        assert hertz[uuid] == want["sm_mhz"] * 1e6
        assert used[uuid] == want["used"]
        assert ratio[uuid] == pytest.approx(want["util"] / 100)
    assert len(series(text, "DCGM_FI_DEV_FB_CAPACITY_BYTES")) == 8
    assert series(text, "DCGM_FI_DEV_GPU_TEMP") == [] and series(text, "DCGM_FI_DEV_SM_CLOCK") == []
    labels, _ = series(text, "DCGM_FI_DEV_GPU_TEMP_CELSIUS")[0]
    assert "DCGM_FI_SYSTEM_DRIVER_VERSION" in labels and "DCGM_FI_DRIVER_VERSION" not in labels


def test_malformed_counters_file_exits_2_naming_the_line(tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text("# fields\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_POWER_USAGE\n")
    code, _, err = run_cli("--simulate", "t4", "--naming", "dcgm", "--collectors", str(path),
                           "--listen", "127.0.0.1:0")
    errors = [ln for ln in err.splitlines() if ln.startswith("otel-gpu: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert f"collectors file {path}: line 3:" in errors[0]


def test_bad_naming_profile_is_one_line():
    code, _, err = run_cli("--simulate", "t4", "--naming", "otel,datadog")
    assert code == 2 and err.strip().splitlines() == [
        "otel-gpu: error: naming (from flag --naming): expected otel, dcgm and/or kubelet, "
        "got 'datadog'"]


# --- golden exposition of the OpenTelemetry names -------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)(?: -?\d+)?$")
# What differs from run to run (or release to release), not with the names or the scenario.
# (and the collector's own process_* series, read from /proc at the scrape)
_VARYING_VALUE = re.compile(r"^otel_gpu_\w*(?:_seconds|_requests_total)$|^process_\w+$")
_VARYING_LABEL = re.compile(
    r'\b(host_name|service_instance_id|service_version|telemetry_sdk_version|otel_gpu_version|'
    r'otel_gpu_pynvml_version|process_runtime_version)="(?:[^"\\]|\\.)*"'
)
VARIES = "<varies>"


def _normalised(text: str) -> str:
    """The exposition with what varies between runs replaced by ``<varies>``: ages,
    durations, request counts, the Resource's instance id, host and versions, any
    timestamp. Families are sorted by name and each family's samples sorted: the
    SDK lists a family when it first had data, which depends on whether the first
    scrape came before the kubelet's first answer.
    """
    families: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            name = line.split()[2]
            families.setdefault(name, []).append(line)
            samples.setdefault(name, [])
            continue
        match = _SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        labels = _VARYING_LABEL.sub(rf'\1="{VARIES}"', labels or "")
        value = VARIES if _VARYING_VALUE.match(name) else value
        family = next((f for f in families if name in (f, f + "_total")), name)
        samples.setdefault(family, []).append(f"{name}{labels} {value}")
    out = []
    for name in sorted(samples):
        out += families.get(name, []) + sorted(samples[name])
    return "\n".join(out) + "\n"


def _golden_pods(scenario: str) -> tuple[list, dict[str, str]]:
    """The pods of the dcgm and kubelet golden expositions (tests/export/naming/test_naming.py),
    and the devices held whole by one of them: uuid -> pod name.
    """
    def held(name: str, resource: str, device_id: str):
        return pod(name, container("main", devices(resource, device_id)), namespace="ml")

    if scenario == "h100x8":
        uuids = profile_uuids("h100x8")
        pods = ([held(f"train-{i}", "nvidia.com/gpu", uuids[i]) for i in range(3)]
                + [held(f"infer-{i}", "nvidia.com/gpu", f"{uuids[7]}::{i}") for i in range(3)])
        return pods, {uuids[i]: f"train-{i}" for i in range(3)}
    gpus = sim.load_scenario(scenario).devices
    mig = {m.gpu_instance_id: m.uuid for m in gpus[0].mig}
    pods = [held("big", "nvidia.com/mig-3g.20gb", mig[1]),
            held("small", "nvidia.com/mig-1g.5gb", mig[13]),
            held("whole", "nvidia.com/gpu", gpus[1].uuid)]
    return pods, {mig[1]: "big", mig[13]: "small", gpus[1].uuid: "whole"}


def golden_path(scenario: str, device_attributes: str) -> Path:
    """``all`` keeps the name the exposition had before the info metric (its series are
    those, and the info series beside them)."""
    suffix = "" if device_attributes == "all" else f"-{device_attributes}"
    return GOLDEN / f"otel-{scenario}{suffix}.prom"


@pytest.mark.parametrize("device_attributes", ["identity", "all"])
@pytest.mark.parametrize("scenario", ["h100x8", "a100-mig"])
def test_golden_otel_exposition(collector, kubelet, scenario, device_attributes):
    pods, owners = _golden_pods(scenario)
    kubelet.set_pods(pods)
    proc = collector("--simulate", scenario, "--naming", "otel", "--node-name", "gpu-node-1",
                     "--kubelet-socket", kubelet.socket_path, "--kubelet-interval", "1h",
                     "--device-attributes", device_attributes, interval="1h")
    rows = sum(len(c.devices[0].device_ids) for p in pods for c in p.containers)

    def attributed():
        """The body once every device series shows the kubelet's answer (a scrape while
        the pods are joined to the sample can mix series from before and after).
        """
        text = proc.metrics()
        if series(text, "otel_gpu_kubelet_pods") != [({}, float(len(pods)))]:
            return None
        if len(series(text, "nvidia_gpu_k8s_allocation")) != rows:
            return None
        for name, labels, _ in parse_samples(text):
            per_container = name.startswith((
                "nvidia_gpu_k8s_allocation", "nvidia_gpu_k8s_energy", "nvidia_gpu_k8s_time",
                "nvidia_gpu_k8s_idle", "nvidia_gpu_time_", "nvidia_gpu_outside"))
            if name == "nvidia_gpu_info":  # the device's, never its pod's
                continue
            if "hw_id" in labels and not per_container and (
                    labels.get("k8s_pod_name", "") != owners.get(labels["hw_id"], "")):
                return None
        return text

    raw = wait_until(attributed, what="the pods on every series of the first sample")
    assert series(raw, "otel_gpu_samples_total") == [({}, 1.0)]
    text = _normalised(raw)
    path = golden_path(scenario, device_attributes)
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 rewrites it"


# --- dcgm-exporter's 1.x names and its MIG default ------------------------------------


def test_the_default_body_weighs_what_the_readme_says():
    """The README's reason for one default (``all``): the same series, about half the raw
    bytes with ``identity``, and gzipped bodies within a quarter of each other."""
    full = (GOLDEN / "otel-h100x8.prom").read_bytes()
    lean = (GOLDEN / "otel-h100x8-identity.prom").read_bytes()
    count = [sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
             for body in (full, lean)]
    assert count[0] == count[1] > 800
    assert len(lean) < 0.55 * len(full)
    packed = [len(gzip.compress(body, 5)) for body in (full, lean)]
    assert 0.75 * packed[0] < packed[1] < packed[0], packed


def test_the_1x_compatibility_counters_file_is_served_under_its_names(collector):
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "-f", str(COMPAT_CSV),
                     interval="1h")
    text = _wait_for(proc, "dcgm_gpu_temp")
    expected = first_sample_values("h100x8")
    temps = {lab["UUID"]: v for lab, v in series(text, "dcgm_gpu_temp")}
    assert temps == {uuid: want["temp"] for uuid, want in expected.items()}
    used = {lab["UUID"]: v for lab, v in series(text, "dcgm_fb_used")}
    assert used == pytest.approx({uuid: want["used"] / 2**20 for uuid, want in expected.items()})
    for name in ("dcgm_sm_clock", "dcgm_memory_clock", "dcgm_power_usage",
                 "dcgm_total_energy_consumption", "dcgm_gpu_utilization", "dcgm_xid_errors"):
        assert len(series(text, name)) == 8, name
    assert "DCGM_FI_DEV_GPU_TEMP" not in text
    assert text.count("# TYPE dcgm_fi_prof_pcie_tx_bytes ") <= 1  # listed twice, served once
    assert proc.proc.poll() is None  # nothing in the file stops it


def test_a_mig_gpus_memory_is_counted_once(collector):
    proc = collector("--simulate", "a100-mig", "--naming", "otel,dcgm", interval="1h")
    text = _wait_for(proc, "DCGM_FI_DEV_FB_USED")
    otel = series(text, "hw_gpu_memory_usage_bytes")
    parents = {lab["hw_parent"] for lab, _ in otel if lab.get("hw_parent")}
    # the MIG GPU's memory is its instances': count those, and the whole GPUs
    counted = sum(v for lab, v in otel if lab["hw_id"] not in parents)
    dcgm = series(text, "DCGM_FI_DEV_FB_USED")
    assert sum(v for _, v in dcgm) == pytest.approx(counted / 2**20)
    assert len(dcgm) == len(otel) - len(parents)
    assert all("GPU_I_ID" in lab for lab, _ in dcgm if lab["UUID"] in parents)


def test_nvidias_default_counters_file_on_h100s_exports_every_field_that_applies(collector):
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "-f", str(DEFAULT_CSV))
    wanted = {ln.split(",")[0].strip(): ln.split(",")[1].strip()
              for ln in DEFAULT_CSV.read_text().splitlines()
              if ln.strip() and not ln.startswith("#")}
    series_rows = {name for name, type_ in wanted.items() if type_ != "label"}
    not_applicable = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # bare metal, not a vGPU guest

    def every_field():  # the profiling fields need a second sample
        names = {name for name, _, _ in parse_samples(proc.metrics())}
        return names if series_rows - not_applicable <= names else None

    names = wait_until(every_field, what="every field of the default counters file")
    assert not names & not_applicable
    logged = [ln for ln in proc.lines if "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in ln]
    assert len(logged) == 1 and "vGPU guest" in logged[0]
    labels = series(proc.metrics(), "DCGM_FI_DEV_GPU_TEMP")[0][0]
    assert labels["DCGM_FI_DRIVER_VERSION"] == "550.90.07"  # the file's label row
