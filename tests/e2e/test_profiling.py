"""Profiling metrics through NVML GPM, served by the real otel-gpu process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from otel_gpu import sim
from testkit.exposition import series
from testkit.process import run_cli, wait_until
from tests.support.nvml import profile_uuids

FIXTURES = Path(__file__).parents[1] / "export" / "naming" / "fixtures"
PROFILING_CSV = FIXTURES / "dcgm-profiling-counters.csv"
MIB = 2.0**20
# h100x8's GPUs 0-3 and 4-7: SM_UTIL, ANY_TENSOR_UTIL, DRAM_BW_UTIL (%) at GPU k of the entry
H100X8 = {"sm": ((20, 10), (60, 10)), "tensor": ((10, 6), (40, 6)), "dram": ((18, 7), (46, 7))}
OMITTED = "profiling metrics (NVML GPM) are omitted for"


def h100x8_percent(what: str, index: int) -> float:
    start, step = H100X8[what][index // 4]
    return start + step * (index % 4)


def by_gpu(text: str, name: str, **labels: str) -> dict[str, float]:
    return {lab["hw_id"]: value for lab, value in series(text, name, **labels)}


def wait_for(proc, name: str, count: int, **labels: str) -> str:
    """The first body with ``count`` samples of ``name`` (GPM needs a second sample)."""
    def ready():
        text = proc.metrics()
        return text if len(series(text, name, **labels)) >= count else None

    return wait_until(ready, what=f"{count} {name} series")


def test_h100x8_shows_sm_tensor_and_dram_activity_per_gpu(collector):
    proc = collector("--simulate", "h100x8")
    text = wait_for(proc, "nvidia_gpu_sm_activity", 8)
    uuids = profile_uuids("h100x8")
    sm = by_gpu(text, "nvidia_gpu_sm_activity")
    tensor = by_gpu(text, "nvidia_gpu_tensor_activity", nvidia_gpu_tensor_type="any")
    dram = by_gpu(text, "nvidia_gpu_dram_activity")
    for index, uuid in enumerate(uuids):
        assert sm[uuid] == pytest.approx(h100x8_percent("sm", index) / 100)
        assert tensor[uuid] == pytest.approx(h100x8_percent("tensor", index) / 100)
        assert dram[uuid] == pytest.approx(h100x8_percent("dram", index) / 100)
    # bytes per second, from GPM's MiB/s; each direction its own series
    pcie = {lab["network_io_direction"]: v for lab, v in series(
        text, "nvidia_gpu_pcie_throughput_bytes_per_second", hw_id=uuids[0])}
    assert pcie == {"transmit": 2000 * MIB, "receive": 3500 * MIB}
    kinds = {lab["nvidia_gpu_tensor_type"]
             for lab, _ in series(text, "nvidia_gpu_tensor_activity", hw_id=uuids[0])}
    assert kinds == {"any", "hmma", "imma", "dfma", "dmma"}
    pipes = {lab["nvidia_gpu_pipe"]: v
             for lab, v in series(text, "nvidia_gpu_pipe_activity", hw_id=uuids[5])}
    assert pipes == pytest.approx({"fp64": 0.03, "fp32": 0.24, "fp16": 0.09, "integer": 0.12})
    assert OMITTED not in proc.log


def test_the_first_sample_has_the_profiling_series(collector):
    """Each GPU's first GPM interval is taken at start, so the first scrape has them."""
    proc = collector("--simulate", "h100x8", interval="1h")
    text = proc.wait_sample(1)
    sm = sorted(v for _, v in series(text, "nvidia_gpu_sm_activity"))
    assert sm == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert len(series(text, "nvidia_gpu_tensor_activity")) == 8 * 5


MIG_H100 = """
    name: h100-mig
    devices:
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 85520809984}
        temperature: 40
        gpm: {SM_UTIL: 55}
        mig:
          - profile: 3g.40gb
            gpu_instance_id: 2
            memory: {total: 42949672960, used: 1073741824}
            gpm: {SM_UTIL: 71, ANY_TENSOR_UTIL: 45, DRAM_BW_UTIL: 20}
          - profile: 1g.10gb
            gpu_instance_id: 9
            memory: {total: 10737418240, used: 1073741824}
            gpm: {SM_UTIL: 15, ANY_TENSOR_UTIL: 5, DRAM_BW_UTIL: 3}
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 85520809984}
        temperature: 40
        gpm: {SM_UTIL: 33, ANY_TENSOR_UTIL: 22, DRAM_BW_UTIL: 11}
"""


def test_mig_instances_show_their_own_activity(collector, tmp_path):
    path = tmp_path / "h100-mig.yaml"
    path.write_text(textwrap.dedent(MIG_H100))
    gpus = sim.load_scenario(str(path)).devices
    mig = {m.gpu_instance_id: m.uuid for m in gpus[0].mig}
    proc = collector("--simulate", str(path), "--naming", "otel,dcgm", "-f", str(PROFILING_CSV))
    text = wait_for(proc, "nvidia_gpu_sm_activity", 4)
    assert by_gpu(text, "nvidia_gpu_sm_activity") == pytest.approx(
        {gpus[0].uuid: 0.55, mig[2]: 0.71, mig[9]: 0.15, gpus[1].uuid: 0.33})
    assert by_gpu(text, "nvidia_gpu_tensor_activity", nvidia_gpu_tensor_type="any") == (
        pytest.approx({mig[2]: 0.45, mig[9]: 0.05, gpus[1].uuid: 0.22}))
    assert by_gpu(text, "nvidia_gpu_dram_activity") == pytest.approx(
        {mig[2]: 0.2, mig[9]: 0.03, gpus[1].uuid: 0.11})
    # and under dcgm-exporter's names, with its MIG labels
    dram = {(lab["UUID"], lab.get("GPU_I_ID")): v
            for lab, v in series(text, "DCGM_FI_PROF_DRAM_ACTIVE")}
    assert dram == pytest.approx({(gpus[0].uuid, "2"): 0.2, (gpus[0].uuid, "9"): 0.03,
                                  (gpus[1].uuid, None): 0.11})
    profiles = {lab["GPU_I_ID"]: lab["GPU_I_PROFILE"]
                for lab, _ in series(text, "DCGM_FI_PROF_SM_ACTIVE") if "GPU_I_ID" in lab}
    assert profiles == {"2": "3g.40gb", "9": "1g.10gb"}


def test_a100_mig_has_no_profiling_series_and_says_so_once(collector):
    proc = collector("--simulate", "a100-mig")
    text = proc.wait_sample(4)
    assert series(text, "hw_gpu_memory_usage_bytes")
    for name in ("nvidia_gpu_sm_activity", "nvidia_gpu_tensor_activity",
                 "nvidia_gpu_dram_activity", "nvidia_gpu_pcie_throughput_bytes_per_second"):
        assert name not in text
    lines = [ln for ln in proc.lines if OMITTED in ln]
    assert len(lines) == 1, lines
    for gpu in sim.load_scenario("a100-mig").devices:
        assert gpu.uuid in lines[0]
    assert "Hopper" in lines[0]


def test_check_notes_which_gpus_have_no_profiling_metrics():
    code, out, err = run_cli("check", "--simulate", "a100-mig")
    assert code == 0, err
    notes = [ln for ln in out.splitlines() if ln.startswith("note: ") and "GPM" in ln]
    assert len(notes) == 1
    assert all(f"GPU {i} (" in notes[0] for i in range(3))
    assert "problem: " not in out  # an A100 has no GPM by design: nothing to fix
    code, out, err = run_cli("check", "--simulate", "h100x8")
    assert code == 0, err
    assert "GPM" not in out


def test_dcgm_naming_serves_the_profiling_fields(collector):
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "-f", str(PROFILING_CSV))
    text = wait_for(proc, "DCGM_FI_PROF_SM_ACTIVE", 8)

    def by_index(name: str) -> dict[int, float]:
        return {int(lab["gpu"]): v for lab, v in series(text, name)}

    for index in range(8):
        assert by_index("DCGM_FI_PROF_SM_ACTIVE")[index] == pytest.approx(
            h100x8_percent("sm", index) / 100)
        assert by_index("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")[index] == pytest.approx(
            h100x8_percent("tensor", index) / 100)
        assert by_index("DCGM_FI_PROF_DRAM_ACTIVE")[index] == pytest.approx(
            h100x8_percent("dram", index) / 100)
    assert by_index("DCGM_FI_PROF_PCIE_TX_BYTES")[1] == 2250 * MIB
    assert by_index("DCGM_FI_PROF_NVLINK_RX_BYTES")[4] == 62000 * MIB
    assert by_index("DCGM_FI_PROF_PIPE_INT_ACTIVE")[0] == pytest.approx(0.06)
    assert "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES counter" in text  # the file's type
    assert "# HELP DCGM_FI_PROF_SM_ACTIVE SM busy ratio (at least one warp)." in text
    for line in proc.lines:
        assert "DCGM_FI_PROF" not in line, line  # no field refused


def test_dcgm_naming_serves_the_profiling_fields_under_4_10_names(collector, tmp_path):
    path = tmp_path / "counters-4.10.csv"
    path.write_text(textwrap.dedent("""\
        DCGM_FI_PROF_SM_UTIL_RATIO, gauge, SM activity.
        DCGM_FI_PROF_TENSOR_UTIL_RATIO, gauge, Tensor activity.
        DCGM_FI_PROF_DRAM_UTIL_RATIO, gauge, DRAM activity.
        DCGM_FI_PROF_INT_UTIL_RATIO, gauge, Integer pipe activity.
        DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND, gauge, PCIe bytes sent per second.
        DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND, gauge, NVLink bytes received per second.
        DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND, gauge, NVLink bytes per second.
        """))
    proc = collector("--simulate", "h100x8", "--naming", "dcgm", "-f", str(path))
    text = wait_for(proc, "DCGM_FI_PROF_SM_UTIL_RATIO", 8)
    text = wait_until(lambda: (lambda t: t if len(series(
        t, "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND")) == 8 else None)(proc.metrics()),
        what="the NVLink byte rate (a second sample)")

    def by_index(name: str) -> dict[int, float]:
        return {int(lab["gpu"]): v for lab, v in series(text, name)}

    for index in range(8):
        assert by_index("DCGM_FI_PROF_SM_UTIL_RATIO")[index] == pytest.approx(
            h100x8_percent("sm", index) / 100)
        assert by_index("DCGM_FI_PROF_TENSOR_UTIL_RATIO")[index] == pytest.approx(
            h100x8_percent("tensor", index) / 100)
        assert by_index("DCGM_FI_PROF_DRAM_UTIL_RATIO")[index] == pytest.approx(
            h100x8_percent("dram", index) / 100)
        assert by_index("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND")[index] > 0  # moving
    assert by_index("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")[1] == 2250 * MIB
    assert by_index("DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND")[4] == 62000 * MIB
    assert by_index("DCGM_FI_PROF_INT_UTIL_RATIO")[0] == pytest.approx(0.06)
    assert "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND gauge" in text
    for line in proc.lines:
        assert "not exported" not in line, line  # no field refused
