"""dcgm-exporter's two generations of names: up to 4.8, and 4.9 and later (DCGM 4.7)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from otel_gpu import config, sim
from otel_gpu.export.naming import ProfileOptions, build_profiles
from otel_gpu.export.naming.dcgm import (
    DEFAULT_COUNTERS,
    FIELDS,
    default_columns,
    parse_collectors,
    select_fields,
)
from otel_gpu.export.naming.dcgm.counters import DEFAULT_COUNTERS_CURRENT
from otel_gpu.export.naming.dcgm.current import CURRENT_FIELDS, RENAMES
from otel_gpu.export.naming.health import HealthProfile
from otel_gpu.sample import sources as c
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.snapshot import Snapshot
from testkit.exposition import render_profiles, series
from tests.support.nvml import SOURCES

FIXTURES = Path(__file__).parent / "fixtures"
CURRENT_CSV = FIXTURES / "dcgm-4.10-counters.csv"
MIXED_CSV = FIXTURES / "dcgm-mixed-generations.csv"


def _sample(profile: str) -> Snapshot:
    sim.install(sim.FakeNvml(sim.load_scenario(profile)))
    try:
        nvml = Nvml()
        nvml.init()
        return Sampler(nvml, SOURCES).sample()
    finally:
        sim.uninstall()


def _render(snap: Snapshot, **kw: str) -> str:
    views = [p for p in build_profiles(["dcgm"], ProfileOptions("h", **kw))
             if not isinstance(p, HealthProfile)]
    return render_profiles(views, snap).decode()


def _by_device(text: str, name: str) -> dict[tuple[str, str | None], float]:
    return {(lab["UUID"], lab.get("GPU_I_ID")): v for lab, v in series(text, name)}


def _every_name_file(tmp_path: Path) -> Path:
    """A counters file naming every rename's old and new field."""
    rows = []
    for new, rename in RENAMES.items():
        rows.append(f"{rename.old}, {FIELDS[rename.old].type}, old")
        rows.append(f"{new}, {CURRENT_FIELDS[new].type}, new")
    path = tmp_path / "both.csv"
    path.write_text("\n".join(dict.fromkeys(rows)) + "\n")
    return path


@pytest.mark.parametrize("scenario", ["h100x8", "a100-mig"])
def test_each_new_name_is_the_old_value_in_its_new_unit(tmp_path, scenario):
    snap = _sample(scenario)
    text = _render(snap, collectors_file=str(_every_name_file(tmp_path)))
    compared = 0
    for new, rename in RENAMES.items():
        if CURRENT_FIELDS[new].rate:
            continue  # a rate needs two samples (below)
        old = _by_device(text, rename.old)
        got = _by_device(text, new)
        assert set(got) == set(old), new
        assert got == pytest.approx({k: v * rename.scale for k, v in old.items()}), new
        compared += bool(old)
    assert compared >= 25


def test_the_units_that_change():
    scale = {new: r.scale for new, r in RENAMES.items()}
    assert scale["DCGM_FI_DEV_SM_CLOCK_HERTZ"] == 1e6  # MHz -> Hz
    assert scale["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"] == 1e-3  # mJ -> J
    assert scale["DCGM_FI_DEV_GPU_UTIL_RATIO"] == 0.01  # % -> 0..1
    assert scale["DCGM_FI_DEV_FB_USED_BYTES"] == 2**20  # MiB -> bytes
    assert scale["DCGM_FI_DEV_GPU_TEMP_CELSIUS"] == 1.0
    defaults = {r.old for r in RENAMES.values()} & {n for n, _, _ in DEFAULT_COUNTERS}
    changed = {new for new, r in RENAMES.items() if r.old in defaults and r.scale != 1.0}
    assert len(changed) == 11, sorted(changed)  # the 11 of the default set that change unit


def test_a_counters_file_in_4_10_names_is_served_whole():
    columns, problems = select_fields(parse_collectors(str(CURRENT_CSV)))
    assert problems == []
    text = _render(_sample("h100x8"), collectors_file=str(CURRENT_CSV))
    for name in ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
                 "DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_GPU_UTIL_RATIO",
                 "DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_FB_CAPACITY_BYTES"):
        assert len(series(text, name)) == 8, name
    assert "DCGM_FI_DEV_SM_CLOCK{" not in text and "DCGM_FI_DEV_GPU_TEMP{" not in text
    assert all("DCGM_FI_SYSTEM_DRIVER_VERSION" in lab and "DCGM_FI_DRIVER_VERSION" not in lab
               for lab, _ in series(text, "DCGM_FI_DEV_GPU_TEMP_CELSIUS"))
    assert "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter" in text


def test_a_file_mixing_both_generations_serves_each_name_in_its_unit():
    columns, problems = select_fields(parse_collectors(str(MIXED_CSV)))
    assert problems == []
    text = _render(_sample("h100x8"), collectors_file=str(MIXED_CSV))
    mhz = _by_device(text, "DCGM_FI_DEV_SM_CLOCK")
    assert _by_device(text, "DCGM_FI_DEV_SM_CLOCK_HERTZ") == {k: v * 1e6 for k, v in mhz.items()}
    mib = _by_device(text, "DCGM_FI_DEV_FB_USED")
    assert _by_device(text, "DCGM_FI_DEV_FB_USED_BYTES") == pytest.approx(
        {k: v * 2**20 for k, v in mib.items()})
    labels, _ = series(text, "DCGM_FI_DEV_GPU_TEMP")[0]
    assert labels["DCGM_FI_DRIVER_VERSION"] == labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] \
        == "550.90.07"


def test_the_built_in_set_follows_dcgm_names():
    legacy = [col.name for col in default_columns("legacy")]
    current = [col.name for col in default_columns("current")]
    assert "DCGM_FI_DEV_GPU_UTIL" in legacy and "DCGM_FI_DEV_GPU_UTIL_RATIO" not in legacy
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in current and "DCGM_FI_DEV_GPU_UTIL" not in current
    assert "DCGM_FI_SYSTEM_DRIVER_VERSION" in current and "DCGM_FI_DRIVER_VERSION" in legacy
    assert "DCGM_FI_DEV_FB_CAPACITY_BYTES" in current  # collected by default from 4.9
    # a 4.9 dashboard and a 4.10 one both find the PCIe byte rates
    assert {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"} <= set(current)
    listed = {name for name, _, _ in DEFAULT_COUNTERS_CURRENT}
    assert not {r.old for r in RENAMES.values() if r.since == "4.9"} & listed
    text = _render(_sample("h100x8"), dcgm_names="current")
    assert series(text, "DCGM_FI_DEV_FB_USED_BYTES") and not series(text, "DCGM_FI_DEV_FB_USED")
    with pytest.raises(ValueError, match="dcgm_names"):
        default_columns("newest")


def test_legacy_is_the_default_and_a_bad_value_is_one_line():
    assert config.load([], {}).dcgm_names == "legacy"
    assert config.load([], {"OTEL_GPU_DCGM_NAMES": "current"}).dcgm_names == "current"
    with pytest.raises(config.ConfigError) as bad:
        config.load([], {"OTEL_GPU_DCGM_NAMES": "4.9"})
    assert "dcgm_names" in str(bad.value) and "\n" not in str(bad.value)
    text = _render(_sample("h100x8"))
    assert series(text, "DCGM_FI_DEV_GPU_UTIL") and not series(text, "DCGM_FI_DEV_GPU_UTIL_RATIO")


def _advance(snap: Snapshot, seconds: float, kib: float) -> Snapshot:
    devices = tuple(
        replace(s, values={**s.values, c.NVLINK_TX.key: s.values[c.NVLINK_TX.key] + kib,
                           c.NVLINK_RX.key: s.values[c.NVLINK_RX.key] + 2 * kib})
        if c.NVLINK_TX.key in s.values else s
        for s in snap.devices)
    return replace(snap, devices=devices, seq=snap.seq + 1,
                   taken_monotonic=snap.taken_monotonic + seconds)


def test_the_nvlink_byte_rate_is_the_kib_counters_rate_times_1024():
    (profile,) = [p for p in build_profiles(["dcgm"], ProfileOptions("h", dcgm_names="current"))
                  if not isinstance(p, HealthProfile)]
    first = _sample("h100x8")
    assert any(c.NVLINK_TX.key in s.values for s in first.devices)
    name = "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND"
    once = render_profiles([profile], first).decode()
    assert series(once, name) == []  # one sample cannot give a rate: absent, not 0
    second = _advance(first, 10.0, 1000.0)
    twice = render_profiles([profile], second).decode()
    rates = [v for _, v in series(twice, name)]
    assert rates and rates == pytest.approx([3000.0 / 10.0 * 1024] * len(rates))
    # the same snapshot rendered again keeps its rate
    assert render_profiles([profile], second).decode() == twice
