"""Each source's bound accepts every real board's figure that docs/bounds.md names, and still
drops NVML's sentinels and values past it: the table and the definitions stay equal."""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.sources import ALL_ONES_32, SATURATED_64, Source
from otel_gpu.sim.scenario import PROFILES_DIR
from tests.support.nvml import SOURCES

DOC = Path(__file__).resolve().parents[2] / "docs" / "bounds.md"
README = DOC.parents[1] / "README.md"
BY_KEY = {s.key: s for s in SOURCES}
SENTINELS = {"below all ones (32-bit)": ALL_ONES_32, "below 2^63 (64-bit)": SATURATED_64}


def _sources(patterns: tuple[str, ...]) -> tuple[Source, ...]:
    """The sources a row's patterns name."""
    return tuple(s for s in SOURCES if any(fnmatch.fnmatchcase(s.key, p) for p in patterns))


def _number(text: str) -> float:
    """A figure as the docs write it: 15,001."""
    return float(text.replace(",", ""))


def _rows() -> list[dict]:
    """The table's rows: sources (patterns), units, bound, figure, board, margin."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[0].startswith("`"):
            continue
        sources, units, bound, figure, board, _where, margin = cells
        patterns = tuple(re.findall(r"`([^`]+)`", sources))
        rows.append({"patterns": patterns, "sources": _sources(patterns),
                     "units": {u.strip() for u in units.split(",")}, "bound": bound,
                     "figure": _number(figure), "board": board, "margin": margin})
    return rows


ROWS = _rows()
GROUPS: dict[tuple[str, ...], list[dict]] = {}
for _row in ROWS:
    GROUPS.setdefault(_row["patterns"], []).append(_row)


def _id(row: dict) -> str:
    """A row's test id: its first source and its figure."""
    return f"{row['patterns'][0]}={row['figure']:g}"


def _range(bound: str) -> tuple[float, float] | None:
    """The (low, high) a row states, or None for a sentinel-only row."""
    if bound in SENTINELS:
        return None
    low, high = bound.split("..")
    return _number(low), _number(high)


def test_the_table_is_there_and_names_each_source_once():
    assert len(ROWS) > 30
    for patterns in GROUPS:
        for p in patterns:
            assert any(fnmatch.fnmatchcase(k, p) for k in BY_KEY), f"{p} names no source"
    named = [s.key for rows in GROUPS.values() for s in rows[0]["sources"]]
    assert sorted(named) == sorted(BY_KEY), "each source read is on exactly one set of rows"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_row_states_the_bound_on_the_definition(row):
    stated = _range(row["bound"])
    for src in row["sources"]:
        assert src.unit in row["units"], (src.key, src.unit)
        if stated is None:
            assert src.bounds == (0.0, math.inf), src.key
            assert src.sentinel == SENTINELS[row["bound"]], src.key
        else:
            assert src.bounds == stated, src.key
    assert {s.unit for s in row["sources"]} == row["units"]


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_each_figure_the_docs_name_is_a_reading(row):
    for src in row["sources"]:
        assert src.accepts(row["figure"]), (src.key, row["figure"], row["board"])
    stated = _range(row["bound"])
    if stated is not None and row["margin"] != "by definition":
        assert abs(stated[1] / row["figure"] - _number(row["margin"])) <= 0.05 + 1e-9, row
        assert _number(row["margin"]) >= 1.4, "a hardware bound leaves a margin"


def test_the_first_row_of_a_bound_from_hardware_is_its_largest_figure():
    for rows in GROUPS.values():
        if rows[0]["margin"] != "by definition" and _range(rows[0]["bound"]) is not None:
            assert rows[0]["figure"] == max(r["figure"] for r in rows), rows[0]["patterns"]


@pytest.mark.parametrize("src", SOURCES, ids=lambda s: s.key)
def test_sentinels_and_values_past_each_bound_are_dropped(src):
    low, high = src.bounds
    for value in (ALL_ONES_32, 2**64 - 1, SATURATED_64, math.nan, math.inf, -math.inf,
                  low - 1):
        if src.sentinel == SATURATED_64 and value == ALL_ONES_32:
            continue  # a 64-bit counter passes 32 bits
        assert not src.accepts(value), (src.key, value)
    if math.isfinite(high):
        assert src.accepts(high) and not src.accepts(math.nextafter(high, math.inf)), src.key
        assert not src.accepts(high * 10), src.key
    assert src.accepts(max(low, 1.0))


def test_a_memory_clock_is_not_bounded_as_an_sm_clock():
    assert BY_KEY["clock.memory"].bounds[1] > 2 * BY_KEY["clock.sm"].bounds[1]
    assert BY_KEY["clock.max.memory"].bounds == BY_KEY["clock.memory"].bounds


def test_the_readme_states_the_bounds_the_code_has():
    text = " ".join(README.read_text(encoding="utf-8").split())
    paragraph = text[text.index("One bad GPU stays one bad GPU"):]
    paragraph = paragraph[:paragraph.index("docs/bounds.md")]
    stated = {
        "utilisation outside 0..100 %": BY_KEY["util.gpu"].bounds == (0, 100),
        "a temperature past 150 C": BY_KEY["temp.gpu"].bounds[1] == 150,
        "power past 10 kW": BY_KEY["power"].bounds[1] == 10_000_000,
        "SM or video clock past 6 GHz": BY_KEY["clock.sm"].bounds[1] == 6_000,
        "a memory clock past 30 GHz": BY_KEY["clock.memory"].bounds[1] == 30_000,
    }
    for words, true in stated.items():
        assert words in paragraph and true, words


# --- through the sampler, on the simulator --------------------------------------------


def _gpu(memory: int, max_memory: int) -> dict:
    with open(PROFILES_DIR / "h100x8.yaml", encoding="utf-8") as f:
        gpu = yaml.safe_load(f)["devices"][0]
    gpu.update(count=1, name="NVIDIA GeForce RTX 5090")
    gpu["clocks"] = {"graphics": 2422, "sm": 2422, "memory": memory, "video": 1965}
    gpu["max_clocks"] = {"graphics": 3090, "sm": 3090, "memory": max_memory, "video": 3090}
    return gpu


def _sample(fake_nvml, gpu: dict):
    fake_nvml(yaml.safe_dump({"devices": [gpu]}))
    nvml = Nvml()
    nvml.init()
    return Sampler(nvml, SOURCES).sample()


def _clock_points(snap) -> dict[tuple[str, str], float]:
    reader = InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: snap,
                                    clock=lambda: snap.taken_monotonic)
    try:
        data = reader.get_metrics_data()
        assert data is not None
        return {(m.name, str(p.attributes["nvidia.gpu.clock.domain"])): p.value
                for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name.startswith("nvidia.gpu.clock.")
                and m.name.endswith("frequency") for p in m.data.data_points}
    finally:
        provider.shutdown()


@pytest.mark.parametrize("memory, max_memory", [(14001, 15001), (15001, 15001),
                                                (10501, 10501), (10001, 10001)])
def test_a_gddr_memory_clock_is_exported(fake_nvml, memory, max_memory):
    snap = _sample(fake_nvml, _gpu(memory, max_memory))
    (device,) = snap.devices
    assert device.values["clock.memory"] == memory
    assert device.values["clock.max.memory"] == max_memory
    assert device.not_available == 0
    points = _clock_points(snap)
    assert points[("nvidia.gpu.clock.frequency", "memory")] == memory * 1e6
    assert points[("nvidia.gpu.clock.max_frequency", "memory")] == max_memory * 1e6
    assert points[("nvidia.gpu.clock.max_frequency", "sm")] == 3090e6


@pytest.mark.parametrize("memory", [30_001, ALL_ONES_32])
def test_a_memory_clock_past_its_bound_is_dropped_and_the_rest_kept(fake_nvml, memory):
    gpu = _gpu(memory, 15001)
    gpu["clocks"]["sm"] = 6_001  # past an SM clock's bound, though a memory clock's within
    (device,) = _sample(fake_nvml, gpu).devices
    assert "clock.memory" not in device.values and "clock.sm" not in device.values
    assert device.values["clock.max.memory"] == 15001
    assert device.values["clock.graphics"] == 2422
    assert device.not_available == 2

